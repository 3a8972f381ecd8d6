"""What setup.py declares (its `setup()` keywords and module-level names), read by running it with setuptools'
`setup` replaced: the tests hold the package's own records (extras, supported releases) to it."""

import runpy
from pathlib import Path
from unittest import mock

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"


def setup_py() -> dict:
    """setup.py's module-level names, with the keywords it passes to `setup()` under "setup"."""
    called = {}
    with mock.patch("setuptools.setup", lambda **kwargs: called.update(kwargs)):
        names = runpy.run_path(str(SETUP_PY))
    return {**names, "setup": called}
