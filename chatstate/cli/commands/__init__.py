"""One module per subcommand group, each imported only when its command runs."""
