"""Megatron-LM's ``--split-sentences``: NLTK punkt sentence splitting for ``preprocess_data``.

nltk is optional and imported only here, when sentences are split. The punkt model of ``--lang``
comes from NLTK's data path (``$NLTK_DATA``, ``~/nltk_data``, ...): ``punkt_tab`` for nltk >= 3.8.2
(``PunktTokenizer``; 3.9 no longer loads pickles), the ``punkt`` pickle for older ones.
"""

import functools
from typing import List

from megatron_neobert.extras import require_extra

# Megatron-LM splits each text in pieces of this many characters before punkt sees it.
MAX_SPLIT_CHARS = 1_000_000

_MODEL = ("python -m nltk.downloader punkt_tab (nltk < 3.8.2: punkt), "
          "or put the model under $NLTK_DATA/tokenizers/punkt_tab/LANG/")


@functools.lru_cache(maxsize=None)
def _keep_newlines_language_vars():
    """punkt's language variables with Megatron-LM's ``--keep-newlines`` period context: ``\\s*``
    instead of ``\\s+`` after a sentence end, so the whitespace (newlines) after a sentence stays
    in that sentence instead of being dropped between sentences."""
    from nltk.tokenize.punkt import PunktLanguageVars

    class KeepNewlinesLanguageVars(PunktLanguageVars):
        _period_context_fmt = r"""
            \S*                          # word material before the period
            %(SentEndChars)s             # a candidate sentence end
            \s*                          # any whitespace, also none: kept with the sentence
            (?=(?P<after_tok>
                %(NonWord)s              # punctuation
                |
                (?P<next_tok>\S+)        # or the next word
            ))"""

    return KeepNewlinesLanguageVars()


def _punkt_parameters(lang: str):
    require_extra("data", "--split-sentences")  # the punkt model is a separate download, named if missing below
    import nltk
    from nltk.tokenize import punkt

    try:
        if hasattr(punkt, "PunktTokenizer"):
            return punkt.PunktTokenizer(lang)._params
        return nltk.data.load(f"tokenizers/punkt/{lang}.pickle")._params
    except (LookupError, ValueError, OSError) as err:
        reason = next((line.strip() for line in str(err).splitlines() if line.strip()
                       and not line.strip().startswith("*")), type(err).__name__)
        raise ValueError(f"--split-sentences --lang {lang}: no NLTK punkt model for {lang!r} "
                         f"({reason}): {_MODEL}") from None


class SentenceSplitter:
    """Splits a text into sentences as Megatron-LM's ``--split-sentences [--keep-newlines]
    --lang LANG`` does. Pickles as its settings: a process that unpickles it loads the model."""

    def __init__(self, lang: str = "english", keep_newlines: bool = False) -> None:
        params = _punkt_parameters(lang)  # first: it says how to install nltk when it is missing
        from nltk.tokenize.punkt import PunktLanguageVars, PunktSentenceTokenizer

        self.lang, self.keep_newlines = lang, keep_newlines
        lang_vars = _keep_newlines_language_vars() if keep_newlines else PunktLanguageVars()
        self._punkt = PunktSentenceTokenizer(params, lang_vars=lang_vars)

    def split(self, text: str) -> List[str]:
        return [sentence for start in range(0, len(text), MAX_SPLIT_CHARS)
                for sentence in self._punkt.tokenize(text[start:start + MAX_SPLIT_CHARS])]

    def __getstate__(self):
        return {"lang": self.lang, "keep_newlines": self.keep_newlines}

    def __setstate__(self, state):
        self.__init__(**state)
