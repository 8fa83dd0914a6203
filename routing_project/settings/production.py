import os

# Production borrows connections from psycopg's pool (DB_POOL=false: persistent connections).
os.environ.setdefault("DB_POOL", "true")

from .base import *  # noqa: E402, F403
from .base import LOGGING, env  # noqa: E402

# No default: production refuses to start without a real secret.
SECRET_KEY = env("SECRET_KEY")
DEBUG = False
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
LOGGING["handlers"]["console"]["formatter"] = env("LOG_FORMAT", default="json")
