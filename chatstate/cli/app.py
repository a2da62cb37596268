"""The click group: global options and the lazily loaded subcommands.

Subcommands live in their own modules and are imported only when invoked (no
pydantic, openai or httpx2 at startup).
"""

from __future__ import annotations

import importlib

import click

from chatstate._version import __version__

# name -> (module, attribute, one-line help shown by --help without importing the module)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "chat": ("chatstate.cli.repl.chat", "chat", "The chat REPL."),
    "ask": ("chatstate.cli.commands.ask", "ask", "One turn, for scripts: prints only the reply."),
    "list": ("chatstate.cli.commands.manage", "list_cmd", "List conversations, newest first."),
    "replay": ("chatstate.cli.commands.manage", "replay", "Print a stored transcript."),
    "export": ("chatstate.cli.commands.manage", "export", "Write a conversation to a file."),
    "import": ("chatstate.cli.commands.manage", "import_cmd", "Import a transcript file."),
    "rm": ("chatstate.cli.commands.manage", "rm", "Delete a conversation."),
    "prune": ("chatstate.cli.commands.manage", "prune", "Delete old conversations (dry run "
              "unless --yes)."),
    "search": ("chatstate.cli.commands.manage", "search", "Full-text search over transcripts."),
    "gc": ("chatstate.cli.commands.manage", "gc", "Remove images and files no message names "
           "(dry run unless --yes)."),
    "repair": ("chatstate.cli.commands.manage", "repair", "Quarantine a damaged transcript."),
    "doctor": ("chatstate.cli.commands.doctor", "doctor", "Readiness check that touches real "
               "state."),
    "probe": ("chatstate.cli.commands.probe", "probe", "Boot id, hostname and where writes land."),
    "survival": ("chatstate.cli.commands.survival", "survival", "Write/verify checksummed "
                 "records across restarts."),
    "demo": ("chatstate.cli.commands.demo", "demo", "The main job, offline, in a few seconds."),
    "fake-server": ("chatstate.cli.commands.fake_server", "fake_server", "Run the built-in fake "
                    "OpenAI-compatible model."),
    "keygen": ("chatstate.cli.commands.keys", "keygen", "Print a new encryption key."),
    "rekey": ("chatstate.cli.commands.migrate", "rekey", "Re-encrypt the store under a new key "
              "in place (resumable)."),
    "migrate": ("chatstate.cli.commands.migrate", "migrate", "Copy every conversation between "
                "stores."),
    "batch": ("chatstate.cli.commands.batch", "batch", "Resumable batch runner."),
    "serve": ("chatstate.cli.commands.serve", "serve", "OpenAI-compatible proxy that stores every "
              "conversation first."),
    "drill": ("chatstate.cli.commands.drill", "drill", "kill -9 a writer again and again; prove "
              "nothing acknowledged was lost."),
    "templates": ("chatstate.cli.commands.daily", "templates", "Saved system prompts: save, "
                  "list, show, rm."),
    "fork": ("chatstate.cli.commands.daily", "fork", "Copy a conversation's first messages into a "
             "new one."),
    "compact": ("chatstate.cli.commands.daily", "compact", "Summarise older turns; requests send "
                "the summary."),
    "models": ("chatstate.cli.commands.settings", "models", "List the endpoint's models; * "
               "marks the default."),
    "config": ("chatstate.cli.commands.settings", "config", "config.toml's path, and the "
               "settings in effect (secrets hidden)."),
    "usage": ("chatstate.cli.commands.daily", "usage", "Token usage (and cost, given prices) from "
              "the store."),
    "web": ("chatstate.cli.commands.web", "web", "Browse, search and verify conversations in a "
            "browser (read-only)."),
}


ALIASES = {"ls": "list"}
"""Other names a command answers to, left out of the help."""


# The commands whose start-up (see chatstate.cli.started) ends when their conversation is
# open, in turns.open_chat, not when their module is imported.
OPENS_CHAT = frozenset({"ask", "chat"})


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd_name = ALIASES.get(cmd_name, cmd_name)
        if cmd_name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[cmd_name]
        command: click.Command = getattr(importlib.import_module(module), attr)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--store", "store_url", envvar="CHATSTATE_STORE", metavar="URL",
              help="json:///dir, sqlite:///file.db or s3://bucket/prefix (default: "
                   "CHATSTATE_STORE, else .env, else store in config.toml, else SQLite in "
                   "the user data directory).")
@click.option("--allow-ephemeral", is_flag=True, envvar="CHATSTATE_ALLOW_EPHEMERAL",
              help="Accept a store on tmpfs, /tmp or a container layer (data will not "
                   "survive a restart).")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-v", "--verbose", is_flag=True, help="Also print the store's location and "
              "verdict for commands that only read it.")
@click.option("-q", "--quiet", is_flag=True, help="No notices on stderr (warnings, errors "
              "and the output asked for stay).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Format of log lines (always on stderr).")
@click.version_option(version=__version__, package_name="chatstate")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None, allow_ephemeral: bool, debug: bool,
        verbose: bool, quiet: bool, log_format: str) -> None:
    """chatstate: an LLM chat client whose history survives kill -9, restarts and redeploys."""
    from chatstate.cli import started
    from chatstate.cli.common import Env

    if ctx.invoked_subcommand not in OPENS_CHAT:
        started()

    ctx.obj = Env(store_url=store_url, allow_ephemeral=allow_ephemeral, debug=debug,
                  log_format=log_format, verbose=verbose, quiet=quiet)
    ctx.obj.setup_logging()


def render_help() -> str:
    """The top-level help exactly as click prints it (the source of ``_help.TEXT``)."""
    with click.Context(cli, info_name="chatstate", terminal_width=80,
                       **cli.context_settings) as ctx:
        return cli.get_help(ctx) + "\n"
