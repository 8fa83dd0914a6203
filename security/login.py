"""Login throttling against password guessing, for every login that goes through Django's
`authenticate()` (the admin and anything else).

Attempts are counted per (username, client address) and per client address in the shared
rate-limit store (Redis), before the password is checked, and a login that succeeds takes its
count back: so guesses sent together cannot all be checked before the first one fails. Past the
limit, `authenticate()` refuses even the right password until the window ends, so guessing
gets a handful of tries per quarter hour.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_in
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.http import HttpRequest

from security.ratelimit import rate_limit_count, rate_limit_hit, rate_limit_reset, rate_limit_undo

WINDOW_S = 15 * 60


def _address(request: HttpRequest | None) -> str:
    if request is None:
        return "-"
    return str(request.META.get("REMOTE_ADDR") or "-")


def _keys(username: str, request: HttpRequest | None) -> tuple[str, str]:
    # Hashed: usernames do not appear in Redis keys.
    who = hashlib.sha256(f"{username.lower()}|{_address(request)}".encode()).hexdigest()[:32]
    return f"login:user:{who}", f"login:addr:{_address(request)}"


def login_locked(*, username: str, request: HttpRequest | None) -> str | None:
    """Which lock refuses this login now: "address" (every login from it), "user" (this
    username from it), or None."""
    user_key, addr_key = _keys(username, request)
    count = functools.partial(rate_limit_count, window_s=WINDOW_S, held_when_down=True)
    if count(key=addr_key) >= settings.LOGIN_FAILURES_PER_ADDRESS:
        return "address"
    if count(key=user_key) >= settings.LOGIN_FAILURES_PER_USER:
        return "user"
    return None


class ThrottledModelBackend(ModelBackend):
    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if username is None:
            username = kwargs.get("username", "")
        if username is None or password is None:
            return super().authenticate(request, username=username, password=password, **kwargs)
        # The attempt takes its place in the counts before the (slow) password check: checked
        # first and counted after it failed, a burst of guesses all passed the check.
        user_key, addr_key = _keys(username, request)
        # Counted in this process's memory while Redis is down (a budget per web process), not
        # failing open as the intake limits do: guesses are what this stops.
        hit = functools.partial(rate_limit_hit, window_s=WINDOW_S, held_when_down=True)
        within_user = hit(key=user_key, limit=settings.LOGIN_FAILURES_PER_USER).allowed
        within_addr = hit(key=addr_key, limit=settings.LOGIN_FAILURES_PER_ADDRESS).allowed
        if not (within_user and within_addr):
            if request is not None:  # the form says so, and which lock
                request.login_throttled = "user" if within_addr else "address"  # type: ignore[attr-defined]
            # PermissionDenied stops authenticate() here: no other backend gets to try.
            raise PermissionDenied("Too many failed logins; try again later.")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None:  # not a failure: its place is given back
            rate_limit_undo(key=user_key, window_s=WINDOW_S)
            rate_limit_undo(key=addr_key, window_s=WINDOW_S)
        return user


class ThrottledAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin's login form. A locked login is refused by the backend whatever the password,
    and Django's form then says "enter the correct username and password": someone typing the
    right one would keep trying it. This form says the login is locked and for how long."""

    error_messages = {
        **AdminAuthenticationForm.error_messages,
        # Which lock, said as it is: the username's lock leaves the address's other logins.
        "locked_user": "Too many failed logins for this username from your address: it is refused here for up to "
        "%(minutes)d minutes. Try again later.",
        "locked_address": "Too many failed logins from your address: every login from it is refused for up to "
        "%(minutes)d minutes. Try again later.",
    }

    def _locked(self, which: str) -> forms.ValidationError:
        code = f"locked_{which}"
        return forms.ValidationError(self.error_messages[code], code=code, params={"minutes": WINDOW_S // 60})

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        if username and (which := login_locked(username=username, request=self.request)):
            raise self._locked(which)
        try:
            return super().clean()
        except forms.ValidationError:
            # Refused by the backend: the limit was reached meanwhile (guesses sent together).
            if which := getattr(self.request, "login_throttled", None):
                raise self._locked(which) from None
            raise


@receiver(user_logged_in)
def _reset_on_success(sender: Any, request: HttpRequest | None = None, user: Any = None, **kwargs: Any) -> None:
    if user is not None:
        user_key, _ = _keys(user.get_username(), request)
        rate_limit_reset(key=user_key, window_s=WINDOW_S)
