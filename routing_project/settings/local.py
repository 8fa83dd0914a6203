from routing_project.secret_keys import kept_secret_key

from .base import *  # noqa: F403
from .base import SECRET_KEY, VAR_DIR, env

DEBUG = True
# Serve static files from the apps directly (no collectstatic needed in development).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True


if not env.str("SECRET_KEY", default=""):
    # The development default this checkout used before it kept a key of its own still opens
    # the secrets sealed then (webhook and web-form keys; `manage.py reseal_secrets` seals them
    # again under the new key), and signs nothing: no link or session it signs is taken.
    SECRET_BOX_EARLIER_KEYS = [SECRET_KEY]  # base's development default
    SECRET_KEY = kept_secret_key(VAR_DIR / "secret_key")
