"""The core layer: what a transcript is, with no I/O.

Messages and the hash chain (``transcript``), content parts (``content``), chain
events (``events``), tool schemas (``tools``) and redaction (``redact``). Everything
else in chatstate imports these; they import only ``chatstate.errors``.
"""
