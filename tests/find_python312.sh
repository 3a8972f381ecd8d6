# Sourced by the scripts that need CPython 3.12 (CI's second lane, the GPU host's stack, another torch release):
# `find_python312` prints the path of one, on PATH or under pyenv, or nothing. pyenv's shims answer for versions that
# are not selected, so each candidate is asked for its version.
find_python312() {
    local candidate
    for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
        if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
            command -v "$candidate"
            return 0
        fi
    done
}
