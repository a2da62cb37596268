"""The chat REPL: the ``chat`` command, its line input and its slash commands."""
