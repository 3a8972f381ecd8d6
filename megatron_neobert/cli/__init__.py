"""The package's commands, one module each (`main(argv)`, installed as the neobert-* console scripts; setup.py
lists them), and what they and the scripts in tools/ share: flags spelled with dashes as Megatron-LM's (the
underscore spellings of earlier versions are still read, without showing in --help), no abbreviated flags (as
Megatron-LM's), and every flag's default shown in --help.

Kept free of heavy imports (torch, transformers, megatron-core) so that `--help` answers at once.
"""

import argparse
import difflib
import sys


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The tool's docstring as written, and "(default: ...)" after the help of each flag that has a default
    (not after required flags, switches, or flags whose help says what their absence means)."""

    def _get_help_string(self, action):
        if action.required or action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that reads `--max_length` as `--max-length` when only the dashed flag exists, and refuses
    abbreviations: a prefix is an error, not whichever flag it begins (`--task` must not run `--tasks`' grid).

    With `error_class`, a bad command line raises it with one line (argparse's message, the flag a mistyped one
    was probably meant to be) instead of printing the usage and exiting: the trainer's usage fills a screen,
    printed by every rank under torchrun."""

    def __init__(self, *args, error_class=None, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.error_class = error_class

    def error(self, message):
        if self.error_class is None:
            super().error(message)
        guesses = [difflib.get_close_matches(word.split("=")[0], self._option_string_actions, n=1)
                   for word in message.split() if word.startswith("--")]
        meant = sorted({g[0] for g in guesses if g})
        hint = f" (did you mean {' / '.join(meant)}?)" if meant and "unrecognized" in message else ""
        raise self.error_class(f"{message}{hint}; {self.prog} --help lists the flags")

    def _dashed(self, arg: str) -> str:
        if not arg.startswith("--") or "_" not in arg:
            return arg
        flag, sep, value = arg.partition("=")
        dashed = flag.replace("_", "-")
        if flag in self._option_string_actions or dashed not in self._option_string_actions:
            return arg
        return dashed + sep + value

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args([self._dashed(a) for a in args], namespace)


def add_config_flags(parser: argparse.ArgumentParser, defaults, helps: dict) -> None:
    """One flag per field of the dataclass instance `defaults` (`--warmup-steps` for warmup_steps), its value
    the default; Optional[bool] fields become --flag / --no-flag with None (decided at run time) as default."""
    import dataclasses

    for f in dataclasses.fields(defaults):
        value, flag = getattr(defaults, f.name), "--" + f.name.replace("_", "-")
        if value is None:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=helps[f.name])
        else:
            parser.add_argument(flag, type=type(value), default=value, help=helps[f.name])
