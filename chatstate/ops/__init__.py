"""Operations on stored state: migrate, fork, gc, usage, export/import, templates,
doctor, probe, survival. They use the stores and the core, never a model turn."""
