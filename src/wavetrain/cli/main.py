"""``wavetrain`` command line: dispatch and error handling.

User errors (:class:`~wavetrain.core.errors.UserError`) print one line and exit with code 2, and so do
the errors of the machine a user can fix (a full disk, a read-only folder, no memory left); an
interrupted run exits with 130; anything else is a bug and shows its traceback.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import logging
import sys

#: Modules that each add one sub-command with ``register(subparsers)``.
COMMAND_MODULES = (
    "wavetrain.cli.train_cmd",
    "wavetrain.cli.adapt_cmd",
    "wavetrain.cli.evaluate_cmd",
    "wavetrain.cli.classify_cmd",
    "wavetrain.cli.info_cmd",
    "wavetrain.cli.features_cmd",
    "wavetrain.cli.plot_cmd",
    "wavetrain.cli.history_cmd",
    "wavetrain.cli.roc_cmd",
    "wavetrain.cli.cache_cmd",
    "wavetrain.cli.memory_cmd",
    "wavetrain.cli.demo_cmd",
    "wavetrain.cli.sound_cmd",
    "wavetrain.cli.serve_cmd",
    "wavetrain.cli.export_cmd",
)


class _Parser(argparse.ArgumentParser):
    """Options are spelled out (no abbreviations: ``--cache`` is never taken for ``--cache-limit``),
    and an error is one line naming the command's own ``--help``."""

    def __init__(self, *args, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

    def error(self, message):  # one line, exit 2 (argparse's own convention too)
        self.exit(2, f"wavetrain: error: {message} (see `{self.prog} --help`)\n")


class _Version(argparse.Action):
    """``--version``: the version plus what decides speed (FFT backend, compute threads)."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        import wavetrain
        from wavetrain.core.errors import ParameterError
        from wavetrain.core.threads import compute_threads
        from wavetrain.features.fft import fft_backend

        try:
            fft = fft_backend()
        except ParameterError as e:
            fft = f"invalid ({e})"
        print(f"wavetrain {wavetrain.__version__} (FFT backend: {fft}, compute threads: "
              f"{compute_threads()})")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:

    parser = _Parser(prog="wavetrain", description="Train, evaluate and run sound and vibration classifiers "
                                                   "with bounded, predictable memory.")
    parser.add_argument("--version", action=_Version, help="show the version, FFT backend and threads, then exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log diagnostics to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _add_verbose(sub)
    return parser


def _add_verbose(sub) -> None:
    """``-v`` after the sub-command too (``wavetrain train ... -v``), at every level; and each
    command's parser on its namespace (``_parser``: the deepest one parsed), for its errors."""
    for p in set(sub.choices.values()):
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="log diagnostics to stderr")
        p.set_defaults(_parser=p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_verbose(action)


#: Errors of the machine, not of wavetrain, that the user can fix: one line, exit code 2.
_ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EMFILE,
                       errno.ENFILE, errno.ENOMEM)


def main(argv: list[str] | None = None) -> int:
    from wavetrain.core.errors import UserError

    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if command is not None and argv[command:command + 2] in (["plot", "history"], ["plot", "roc"]):
        argv[command:command + 2] = [f"plot-{argv[command + 1]}"]   # `wavetrain [-v] plot history|roc ...`
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:                                           # named by the command that was given them
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:                                 # --help, or argparse's one-line error
        return int(e.code or 0)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", force=True)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        from wavetrain.cli.common import guard_outputs

        guard_outputs(args)     # no output over an input, before anything is opened (commands check each recording too)
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"wavetrain: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wavetrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:
        print("wavetrain: error: out of memory; give --memory-limit so that the run is planned to fit, "
              "or use fewer workers, smaller batches or shorter windows", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in _ENVIRONMENT_ERRNOS:
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"wavetrain: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
