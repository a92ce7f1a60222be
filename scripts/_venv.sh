# Sourced by the scripts: make .venv from the hashed locks, once per lock change. ARBOR_LOCKS names the locks to
# install: the runtime alone by default (scripts/start); scripts/test, scripts/fuzz and CI add requirements-dev.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
ARBOR_LOCKS=${ARBOR_LOCKS:-requirements.txt}
if [ ! -x .venv/bin/python ]; then
  echo "Creating .venv with $("$PYTHON" --version 2>&1) (then installing Arbor's packages into it)…" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
# The stamp lists each lock installed with its hash: a runtime-only venv is topped up when the tests need more,
# and a venv that has the dev lock is not reinstalled for scripts/start.
missing=()
for lock in $ARBOR_LOCKS; do
  line="$(sha256sum "$lock" | cut -d' ' -f1) $lock"
  grep -qxF "$line" "$stamp" 2>/dev/null || missing+=("$lock")
done
if [ "${#missing[@]}" -gt 0 ]; then
  # The first install takes about two minutes: say so, and let pip show each package as it goes, then the long
  # unpacking step and the end (issue 34: it must never sit silent). Nothing buffered on the way (pip, grep; `cut`
  # held every line to the end when the output went to a pipe or a log).
  echo "Installing Arbor's Python packages (${missing[*]}) into .venv (the first time takes about two minutes)…" >&2
  args=()
  for lock in $ARBOR_LOCKS; do args+=(-r "$lock"); done
  PYTHONUNBUFFERED=1 .venv/bin/python -m pip install --progress-bar off --disable-pip-version-check --require-hashes "${args[@]}" \
    | { grep --line-buffered -oE '^(Collecting|Installing collected packages|Successfully installed).{0,80}' || true; } >&2
  for lock in $ARBOR_LOCKS; do
    grep -v " $lock\$" "$stamp" 2>/dev/null > "$stamp.new" || true
    echo "$(sha256sum "$lock" | cut -d' ' -f1) $lock" >> "$stamp.new"
    mv "$stamp.new" "$stamp"
  done
fi
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p var
# A random secret key of this checkout's own, kept out of git (config/settings.py refuses to run without one).
if [ -z "${DJANGO_SECRET_KEY:-}" ] && [ ! -s var/secret_key ]; then
  (umask 077; "$PWD/.venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(50))' > var/secret_key)
fi
