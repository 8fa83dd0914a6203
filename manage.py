#!/usr/bin/env python
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routing_project.settings.local")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        settings.INSTALLED_APPS  # noqa: B018 - loads the settings, which check the environment
    except ImproperlyConfigured as exc:
        # A setting that cannot work (the settings name it): one line, not a traceback of the
        # settings module's import.
        sys.exit(f"Configuration error: {exc}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
