"""Release receiver (`day0 hooks serve`): outside events -> durable journal -> Prefect flow runs.

Public API: `create_app(settings)`, `ReceiverSettings`, `load_settings(path)`, `serve(settings)`,
`auth.sign(secret, body)` for senders.
"""

from day0.receiver.settings import ReceiverSettings, load_settings

__all__ = ["ReceiverSettings", "load_settings", "create_app", "serve"]


def __getattr__(name):  # FastAPI is imported only when the app is actually built
    if name in ("create_app", "serve"):
        from day0.receiver import app

        return getattr(app, name)
    raise AttributeError(name)
