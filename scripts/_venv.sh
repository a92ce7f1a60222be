# Sourced by scripts/start and scripts/test: make .venv from the hashed lock, once per lock change.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # The first install takes about two minutes: say so, and let pip show each package as it goes.
  echo "Installing Arbor's Python packages into .venv (the first time takes about two minutes)…" >&2
  .venv/bin/python -m pip install --progress-bar off --disable-pip-version-check --require-hashes \
    -r requirements.txt | { grep --line-buffered -E '^(Collecting|Successfully installed)' || true; } | cut -c1-100 >&2
  echo "$want" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p var
# A random secret key of this checkout's own, kept out of git (config/settings.py refuses to run without one).
if [ -z "${DJANGO_SECRET_KEY:-}" ] && [ ! -s var/secret_key ]; then
  (umask 077; "$PWD/.venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(50))' > var/secret_key)
fi
