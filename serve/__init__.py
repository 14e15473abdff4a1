"""``grokc serve``: the runner as an OpenAI-compatible HTTP server (Starlette on uvicorn).

limits.py (the hard limits, flags or a TOML file) · api.py (request bodies -> ``Job`` or
``ApiError``) · chat.py (the artifact's chat template) · detok.py (text deltas and stop strings) ·
scheduler.py (continuous batching in the static slots, on one thread that owns the device) ·
metrics.py (Prometheus text) · app.py (the routes) · server.py (uvicorn, readiness, SIGTERM drain) ·
profile.py (per-launch times as a Chrome trace; ``grokc bench --profile`` uses it too).

Only this package imports the ASGI stack; the runner does not.
"""
