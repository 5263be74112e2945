""" "Did you mean ...?": the nearest valid name to a misspelled flag, key or choice.

Spelling slips (``--taks``, ``tempoo``) are found by string similarity; the names
researchers bring from other code (``learning_rate`` for ``lr``) by initials and shared
words, which string similarity alone misses. Torch-free and cheap: it runs while a
usage error is being reported.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence
from typing import Final

#: Similarity (difflib ratio) of a slip: ``taks``/``task``, ``tempoo``/``tempo``.
CLOSE: Final = 0.6
#: A weaker similarity, accepted when nothing closer was found.
LOOSE: Final = 0.45
#: Words shorter than this do not count as shared (``lr`` and ``n`` are everywhere).
MIN_SHARED_WORD: Final = 3


def _words(name: str) -> list[str]:
    return [w for w in name.replace("-", "_").split("_") if w]


def _initials(name: str) -> str:
    return "".join(w[0] for w in _words(name))


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The valid name ``word`` most likely meant, or None when none is close."""
    options = sorted(set(choices))
    if not options or word in options:
        return None
    close = difflib.get_close_matches(word, options, n=1, cutoff=CLOSE)
    if close:
        return close[0]
    bare = word.lstrip("-")
    for option in options:  # learning_rate -> lr, lr -> learning_rate
        plain = option.lstrip("-")
        if len(_words(bare)) > 1 and _initials(bare) == plain:
            return option
        if len(_words(plain)) > 1 and _initials(plain) == bare:
            return option
    shared = [
        option
        for option in options
        if {w for w in _words(bare) if len(w) >= MIN_SHARED_WORD}
        & {w for w in _words(option.lstrip("-")) if len(w) >= MIN_SHARED_WORD}
    ]
    if shared:
        return max(shared, key=lambda o: difflib.SequenceMatcher(None, word, o).ratio())
    loose = difflib.get_close_matches(word, options, n=1, cutoff=LOOSE)
    return loose[0] if loose else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)``, or "" when nothing is close."""
    near = nearest(word, choices)
    return f" (did you mean {near!r}?)" if near else ""


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every ``--flag`` a parser accepts."""
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def chosen_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The deepest sub-command parser ``args`` went through (``esper export tensorboard``:
    tensorboard's), or ``parser`` itself."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None) if action.dest != argparse.SUPPRESS else None
            found = action.choices.get(str(name)) if name is not None else None
            if isinstance(found, argparse.ArgumentParser):
                return chosen_parser(found, args)
    return parser


def unknown_flags_error(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """argparse's "unrecognized arguments" message, with the nearest flag of each."""
    hints = []
    flags = option_strings(parser)
    for extra in extras:
        flag = extra.split("=", 1)[0]
        if flag.startswith("--"):
            near = nearest(flag, flags)
            if near:
                hints.append(f"{flag}: did you mean {near}?")
    text = f"unrecognized arguments: {' '.join(extras)}"
    return text + (f" ({'; '.join(hints)})" if hints else "")


def parse_args_suggesting(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unknown flag of a sub-command is reported by
    that sub-command's parser (its usage) with the nearest flag it accepts (exit 2)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        target = chosen_parser(parser, args)
        target.error(unknown_flags_error(target, extras))
    return args
