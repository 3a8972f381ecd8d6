"""Settings declared once, as dataclass fields, and the command lines generated from them.

A field made with `setting(default, help, ...)` carries everything its flag needs: the spelling (`--lr-decay-iters`
for `lr_decay_iters` unless `flag=` says otherwise), the help text, choices, `nargs`, and, where NeoBERT's recipe sets
another default than Megatron-LM, Megatron-LM's (`megatron_default=`). `add_flags(parser, cls)` turns a dataclass of
such fields into flags, the flag's kind read off the field's type; `parse_given(parser, argv)` returns only what the
command line gave, so that the defaults stay those of the declarations. As in torchtitan and litgpt, nothing about a
setting is written twice.

The parser is Megatron-LM's convention: flags spelled with dashes (the underscore spellings are read too, without
showing in --help), no abbreviations (`--task` must not run `--tasks`), and every flag's default shown in --help.
Kept free of torch, transformers and megatron-core, so that `--help` answers at once.
"""

import argparse
import dataclasses
import difflib
import os
import sys
import typing
from typing import Any, Dict, List, Optional, Sequence, Tuple


def setting(default: Any = None, help: str = "", *, flag: Optional[str] = None, choices: Optional[Sequence] = None,
            nargs: Any = None, metavar: Any = None, megatron_default: Optional[str] = None,
            recipe_default: Optional[str] = None, **extra) -> Any:
    """A dataclass field for one setting and its flag.

    `flag`: the spelling when it is not the field's name dashed (`--no-log-loss-scale-to-tensorboard` for a setting
    that is on by default); `megatron_default`: Megatron-LM's default where the recipe's differs, and
    `recipe_default` the recipe's in words when the field's default does not say it (a derived default: None here,
    "10% of --lr" in --help). `extra`: further metadata for the code that reads the declarations."""
    metadata = dict(help=help, flag=flag, choices=tuple(choices) if choices is not None else None, nargs=nargs,
                    metavar=metavar, megatron_default=megatron_default, recipe_default=recipe_default, **extra)
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def closest(word: str, known) -> List[str]:
    """The one name of `known` that `word` was most likely meant to be, as a list (empty when none is close)."""
    return difflib.get_close_matches(word, known, n=1)


def redeclare(cls, name: str, default: Any) -> Any:
    """`cls`'s setting `name` with another default, for a subclass: the same help and flag."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=default, metadata=field.metadata)


def flag_of(field: dataclasses.Field) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def default_of(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def defaults(cls) -> Dict[str, Any]:
    """{field name: its declared default} of a dataclass of settings."""
    return {f.name: default_of(f) for f in dataclasses.fields(cls)}


def help_of(field: dataclasses.Field) -> str:
    """The field's help, with the recipe's and Megatron-LM's defaults side by side where they differ."""
    meta = field.metadata
    text = meta.get("help", "")
    if meta.get("megatron_default") is not None:
        recipe = meta.get("recipe_default") or str(default_of(field))
        note = f"recipe default {recipe}; Megatron-LM's: {meta['megatron_default']}"
        text = f"{text}; {note}" if text else note
    return text.replace("%", "%%")  # argparse formats help with %


def _value_type(annotation) -> Tuple[type, bool]:
    """(the scalar type, whether it is a list) of a field's annotation: int, Optional[float], List[str], ..."""
    is_list = False
    while typing.get_origin(annotation) in (typing.Union, list, List):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        is_list |= typing.get_origin(annotation) in (list, List)
        annotation = args[0]
    return annotation, is_list


def add_flags(parser, cls) -> None:
    """One flag per field of the dataclass `cls`, onto `parser` (or an argument group): a bool that is False by
    default is a switch; a bool that is True or None (decided at run time) by default is --flag / --no-flag, unless
    the declaration spells only the --no- flag; a list takes `nargs` values, or one value per flag with
    `action="append"`."""
    hints = typing.get_type_hints(cls)
    exclusive = {}  # one_of name -> its mutually exclusive group
    for f in dataclasses.fields(cls):
        kind, is_list = _value_type(hints[f.name])
        meta, default, flag = f.metadata, default_of(f), flag_of(f)
        options = dict(dest=f.name, default=default, help=help_of(f), required=meta.get("required"))
        if kind is bool:
            if default is True and flag.startswith("--no-"):  # declared with only its --no- spelling
                options.update(action="store_false")
            elif default is False:
                options.update(action="store_true")
            else:
                options.update(action=argparse.BooleanOptionalAction)
        else:
            options.update(type=meta.get("type") or kind, choices=meta.get("choices"), metavar=meta.get("metavar"),
                           action=meta.get("action"))
            if is_list and options["action"] != "append":
                options.update(nargs=meta.get("nargs") or "+")
        target = parser
        if meta.get("one_of"):
            if meta["one_of"] not in exclusive:
                exclusive[meta["one_of"]] = parser.add_mutually_exclusive_group(required=True)
            target = exclusive[meta["one_of"]]
        target.add_argument(flag, **{k: v for k, v in options.items() if v is not None or k == "default"})


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The tool's docstring as written, and "(default: ...)" after the help of each flag that has a default
    (not after required flags, switches, or flags whose help says what their absence means)."""

    def _get_help_string(self, action):
        if action.required or action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def _first_rank() -> bool:
    return os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) == "0"


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that reads `--max_length` as `--max-length` when only the dashed flag exists, and refuses
    abbreviations: a prefix is an error, not whichever flag it begins (`--task` must not run `--tasks`' grid).

    A bad command line is one line, `error: ` and argparse's message, the flag a mistyped one was probably meant to
    be and where the flags are listed, without the usage (the trainer's fills a screen, printed by every rank under
    torchrun): on stderr with exit status 2, or raised as `error_class` where given."""

    def __init__(self, *args, error_class=None, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.error_class = error_class

    def print_help(self, file=None):
        # Under torchrun every rank parses the command line: only the first prints --help (they all exit 0).
        if _first_rank():
            super().print_help(file)

    def error(self, message):
        meant = sorted({guess for word in message.split() if word.startswith("--")
                        for guess in closest(word.split("=")[0], self._option_string_actions)})
        hint = f" (did you mean {' / '.join(meant)}?)" if meant and "unrecognized" in message else ""
        line = f"{message}{hint}; {self.prog} --help lists the flags"
        if self.error_class is not None:
            raise self.error_class(line)
        self.exit(2, f"error: {line}\n" if _first_rank() else None)  # the other ranks fail alike, silently

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


class _NotGiven:
    def __repr__(self):
        return "<not given>"


NOT_GIVEN = _NotGiven()


def parse_given(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """{dest: value} of the flags that `argv` gives, and only those: argparse fills in a default only for a dest the
    namespace lacks, so every dest starts as NOT_GIVEN and what is still NOT_GIVEN after the parse was not given."""
    namespace = argparse.Namespace(**{a.dest: NOT_GIVEN for a in parser._actions if a.dest != argparse.SUPPRESS})
    parsed = parser.parse_args(argv, namespace)
    return {k: v for k, v in vars(parsed).items() if v is not NOT_GIVEN}


def with_defaults(parser: argparse.ArgumentParser, given: Dict[str, Any]) -> argparse.Namespace:
    """`given` (from parse_given) completed with the parser's defaults."""
    values = {a.dest: a.default for a in parser._actions if a.dest != argparse.SUPPRESS}
    return argparse.Namespace(**{**values, **given})


def convert_value(parser: argparse.ArgumentParser, dest: str, value: Any) -> Any:
    """A value from a settings file, as the flag would have read it from the command line: a YAML string such as
    `6e-4` (YAML reads it as a string) goes through the flag's type and choices."""
    action = next(a for a in parser._actions if a.dest == dest)
    if action.nargs not in (None, "?", 0):  # a list flag: a single value is a list of one
        return [_convert_one(parser, action, v) for v in (value if isinstance(value, list) else [value])]
    if isinstance(value, list):
        raise ValueError(f"a single value, not a list ({value!r})")
    return _convert_one(parser, action, value)


def _convert_one(parser: argparse.ArgumentParser, action: argparse.Action, value: Any) -> Any:
    if isinstance(value, str) and action.type is not None:
        try:
            value = parser._get_value(action, value)
        except argparse.ArgumentError as err:
            raise ValueError(err.message) from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{value!r} is not one of {', '.join(map(str, action.choices))}")
    return value
