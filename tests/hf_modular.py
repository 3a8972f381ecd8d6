"""Generates megatron_neobert/hf/{configuration,modeling}_neobert.py from modular_neobert.py with transformers' own
modular converter, as transformers generates its models' files.

    TRANSFORMERS_UTILS=/path/to/transformers/utils python tests/hf_modular.py          # diff against the committed
    TRANSFORMERS_UTILS=/path/to/transformers/utils python tests/hf_modular.py --write  # rewrite them

The converter (`utils/modular_model_converter.py` and the modules beside it) is not on PyPI: TRANSFORMERS_UTILS names
the `utils/` folder of a transformers checkout at the installed release's tag. It runs in a scratch copy of the
installed release's source distribution (the same sdist tests/test_hf_transformers_common.py downloads), with the
modular file at `src/transformers/models/neobert/`, and formats with the ruff release that transformers pins. Its
output imports transformers relatively (`from ...modeling_utils import`), as a file inside transformers does; the
copies here import the same names from `transformers.` (`to_package_imports`), the only change.
"""

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import transformers

HF_DIR = Path(__file__).resolve().parents[1] / "megatron_neobert" / "hf"
MODULAR = HF_DIR / "modular_neobert.py"
GENERATED = ("configuration_neobert.py", "modeling_neobert.py")
VERSION = transformers.__version__


class ConverterUnavailable(RuntimeError):
    """What the converter needs is not on this machine; the message says what and how to provide it."""


def sdist_path() -> Path:
    from test_hf_transformers_common import CACHE

    return CACHE / f"transformers-{VERSION}.tar.gz"


def converter_dir() -> Path:
    utils = os.environ.get("TRANSFORMERS_UTILS")
    if not utils or not (Path(utils) / "modular_model_converter.py").is_file():
        raise ConverterUnavailable(
            f"transformers' modular converter is not on PyPI: set TRANSFORMERS_UTILS to the utils/ folder of a "
            f"transformers checkout at v{VERSION} (got {utils!r})")
    return Path(utils)


def ruff_bin_dir(sdist_root: Path) -> Path:
    """The folder of a `ruff` executable of the release transformers pins (its formatting is part of the output)."""
    pinned = re.search(r'"ruff==([\d.]+)"', (sdist_root / "setup.py").read_text()).group(1)
    for folder in [sysconfig.get_path("scripts"), *os.environ.get("PATH", "").split(os.pathsep)]:
        ruff = Path(folder) / "ruff"
        if ruff.is_file():
            version = subprocess.run([str(ruff), "--version"], capture_output=True, text=True).stdout.split()[-1]
            if version == pinned:
                return ruff.parent
    raise ConverterUnavailable(f"no ruff {pinned} (the release transformers {VERSION} pins) on PATH or beside "
                               f"this Python: pip install ruff=={pinned}")


def scratch_tree(work: Path) -> Path:
    """The installed release's source distribution, unpacked under `work` (src/ and pyproject.toml)."""
    sdist = sdist_path()
    if not sdist.is_file():
        raise ConverterUnavailable(f"no transformers {VERSION} sdist at {sdist}: run "
                                   f"tests/test_hf_transformers_common.py once, which downloads it")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.split("/", 2)[1:2] in (["src"], ["pyproject.toml"], ["setup.py"])]
        tar.extractall(work, members=members, filter="data")
    return work / f"transformers-{VERSION}"


def run_converter(root: Path, modular: Path) -> dict:
    """{file name: text} that the converter generates from `modular`, placed as transformers' own model folder."""
    model_dir = root / "src" / "transformers" / "models" / modular.stem.removeprefix("modular_")
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(modular, model_dir / modular.name)
    env = dict(os.environ, PATH=f"{ruff_bin_dir(root)}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run([sys.executable, str(converter_dir() / "modular_model_converter.py"), "--files",
                           str(model_dir.relative_to(root) / modular.name), "--num_workers", "1"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the modular converter failed on {modular.name}:\n{done.stdout}{done.stderr}")
    return {name: (model_dir / name).read_text(encoding="utf-8") for name in sorted(os.listdir(model_dir))
            if name != modular.name and name.endswith(".py") and name != "__init__.py"}


def to_package_imports(code: str) -> str:
    """transformers' relative imports of a file in `transformers/models/<model>/` as absolute ones."""
    code = re.sub(r"^from \.\.\. import ", "from transformers import ", code, flags=re.M)
    code = re.sub(r"^from \.\.\.(\w)", r"from transformers.\1", code, flags=re.M)
    return re.sub(r"^from \.\.(\w)", r"from transformers.models.\1", code, flags=re.M)


def generated_files(work: Path) -> dict:
    """{file name: the text this package should hold} for the current modular file."""
    return {name: to_package_imports(code) for name, code in run_converter(scratch_tree(work), MODULAR).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the generated files of megatron_neobert/hf/")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        files = generated_files(Path(work))
    stale = 0
    for name, code in files.items():
        committed = (HF_DIR / name).read_text(encoding="utf-8") if (HF_DIR / name).is_file() else ""
        if committed == code:
            continue
        stale += 1
        if args.write:
            (HF_DIR / name).write_text(code, encoding="utf-8")
            print(f"wrote {HF_DIR / name}")
        else:
            sys.stdout.writelines(difflib.unified_diff(committed.splitlines(True), code.splitlines(True),
                                                       f"committed/{name}", f"generated/{name}"))
    return 0 if args.write or not stale else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    raise SystemExit(main())
