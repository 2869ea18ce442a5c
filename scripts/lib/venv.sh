# shellcheck shell=bash
# Create and refresh the project's virtualenvs under .venv/. Source from the repo root, then:
#
#   venv_ensure NAME X.Y PIP_ARGS...   # e.g. venv_ensure py311-django52 3.11 -e '.[postgres]' 'django<6'
#
# Requirements in the array VENV_NO_DEPS are installed after, with --no-deps: packages whose
# metadata pins what the venv must keep (e.g. Django); their dependencies go in PIP_ARGS.
#
# A venv is (re)installed only when its stamp (a hash of the Python version, the pip arguments
# and pyproject.toml) changes, so a warm run costs a few milliseconds and no network.

VENV_ROOT=${VENV_ROOT:-.venv}
# Bump to force every venv to reinstall after changing how they are built.
_VENV_RECIPE=1

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# Prints "X.Y /path/to/python" for an interpreter, or fails.
_venv_probe() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2], sys.executable)' 2>/dev/null
}

# Prints the path of a Python X.Y interpreter. pyenv's shims are not trusted blindly: a shim
# for a version that is not selected exists but fails, so every candidate is probed.
venv_find_python() {
    local want=$1 cand got
    local -a cands=()
    local pyenv_root=${PYENV_ROOT:-}
    if [[ -z $pyenv_root ]] && command -v pyenv >/dev/null; then pyenv_root=$(pyenv root 2>/dev/null || true); fi
    [[ -n $pyenv_root ]] || pyenv_root=$HOME/.pyenv
    # Newest installed patch release first.
    while IFS= read -r cand; do
        cands+=("$cand")
    done < <(printf '%s\n' "$pyenv_root"/versions/"$want".*/bin/python | sort -rV)
    cands+=("$(command -v "python$want" || true)" "/usr/bin/python$want" "$(command -v python3 || true)")
    for cand in "${cands[@]}"; do
        [[ -n $cand && -x $cand ]] || continue
        got=$(_venv_probe "$cand") || continue
        if [[ ${got%% *} == "$want" ]]; then
            echo "${got#* }"
            return 0
        fi
    done
    echo "venv: no Python $want found (tried pyenv in $pyenv_root, python$want, python3)" >&2
    return 1
}

# pip, quiet but showing errors. Drops the "Location 'file:///...' is ignored" warnings that a
# machine-wide pip.conf pointing at absent local indexes prints for every package.
_venv_pip() {
    local python=$1
    shift
    { "$python" -m pip "$@" 2>&1 1>&3 | { grep -v "^WARNING: Location 'file:.*' is ignored" || true; } >&2; } 3>&1
}

venv_ensure() {
    local name=$1 want=$2
    shift 2
    local dir=$VENV_ROOT/$name stamp got python
    local -a no_deps=("${VENV_NO_DEPS[@]+"${VENV_NO_DEPS[@]}"}")
    stamp=$({ echo "$_VENV_RECIPE $want"; printf '%s\n' "$@" "${no_deps[@]}"; cat pyproject.toml; } | sha256sum | cut -d' ' -f1)

    got=$(_venv_probe "$dir/bin/python" || true)
    if [[ ${got%% *} != "$want" ]]; then
        # Missing, broken (e.g. its base interpreter was removed) or the wrong version: start over.
        rm -rf "$dir"
        python=$(venv_find_python "$want") || return 1
        echo "venv: creating $dir with $python" >&2
        "$python" -m venv "$dir" || return 1
    elif [[ -f $dir/.stamp && $(<"$dir/.stamp") == "$stamp" ]]; then
        return 0
    fi

    echo "venv: installing into $dir: $*" >&2
    rm -f "$dir/.stamp"
    # The base interpreters ship old pips; `--group` (PEP 735 dependency groups) needs pip >= 25.1.
    _venv_pip "$dir/bin/python" install -q --upgrade pip || return 1
    _venv_pip "$dir/bin/python" install -q "$@" || return 1
    if ((${#no_deps[@]})); then
        _venv_pip "$dir/bin/python" install -q --no-deps "${no_deps[@]}" || return 1
    fi
    echo "$stamp" >"$dir/.stamp"
}
