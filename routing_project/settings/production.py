import os

# Production borrows connections from psycopg's pool (DB_POOL=false: persistent connections).
os.environ.setdefault("DB_POOL", "true")

from django.core.exceptions import ImproperlyConfigured  # noqa: E402

from .base import *  # noqa: E402, F403
from .base import LOGGING, env, log_format  # noqa: E402

# No default: production refuses to start without a real secret. Set but empty counts as
# missing: docker-compose.yml passes `${SECRET_KEY:-}`, and Django would otherwise start and
# then answer every request with a 500.
SECRET_KEY = env("SECRET_KEY")
if not SECRET_KEY.strip():
    raise ImproperlyConfigured("SECRET_KEY is empty: set it to a long random value.")
DEBUG = False
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# Once TLS is in front for good: browsers then refuse plain HTTP to the host for this long (a
# year: 31536000). Off by default: turned on over plain HTTP it locks browsers out.
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
if SECURE_HSTS_SECONDS < 0:
    raise ImproperlyConfigured(f"SECURE_HSTS_SECONDS is {SECURE_HSTS_SECONDS}: give 0 (off) or more (s).")
LOGGING["handlers"]["console"]["formatter"] = log_format("json")
# E-mails to reps go out over SMTP (EMAIL_HOST ...): the development default, a file per e-mail
# on the machine, would mark every e-mail sent while it stayed inside a container.
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
