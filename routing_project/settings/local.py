from .base import *  # noqa: F403

DEBUG = True
# Serve static files from the apps directly (no collectstatic needed in development).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
