# Source on a GPU node that has python3 with torch, numpy, cuda-bindings, tokenizers, typer but
# no grokc install: makes `import grokc` resolve to this checkout (the repository root linked as the
# `grokc` namespace package, so grokc.core, grokc.cli, ... are its folders) and installs carried wheels.
#   . scripts/device_env.sh            (from the repository root)
#   grokc bench ARTIFACT               (the CLI: python3 -m grokc.cli)
export PYTHONUNBUFFERED=1
mkdir -p /tmp/gk && ln -sfn "$PWD" /tmp/gk/grokc
if compgen -G ".carry/whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/whl/*.whl
fi
export PYTHONPATH=/tmp/gk:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
grokc() { python3 -m grokc.cli "$@"; }
