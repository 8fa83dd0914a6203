"""Behind a load balancer or proxy every request came from its address: the per-address
limits (failed logins, bad web-form signatures) then counted every client together, and one
client's failed logins locked every login out. TRUSTED_PROXY_COUNT names the proxies in front;
the client's address is read from the end of X-Forwarded-For, which they append to."""

import uuid

import pytest
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.test import Client, RequestFactory

from routing_project.middleware import ClientAddressMiddleware


def address_seen(forwarded: str | None, peer: str = "10.0.0.1") -> str:
    seen: list[str] = []

    def view(request):
        seen.append(request.META["REMOTE_ADDR"])
        return HttpResponse()

    headers = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    ClientAddressMiddleware(view)(RequestFactory().get("/healthz", REMOTE_ADDR=peer, **headers))
    return seen[0]


@pytest.mark.parametrize(
    ("proxies", "forwarded", "client"),
    [
        (0, "203.0.113.9", "10.0.0.1"),  # nothing in front: the header is anyone's to write
        (1, "203.0.113.9", "203.0.113.9"),
        (1, "1.1.1.1, 203.0.113.9", "203.0.113.9"),  # what the client wrote itself counts for nothing
        (1, "1.1.1.1,203.0.113.9", "203.0.113.9"),
        (1, "2001:db8::7", "2001:db8::7"),
        (2, "1.1.1.1, 198.51.100.7, 10.0.0.2", "198.51.100.7"),
        (2, "198.51.100.7", "10.0.0.1"),  # fewer entries than proxies: around them, the peer's
        (1, None, "10.0.0.1"),
        (1, "", "10.0.0.1"),
        (1, "not an address", "10.0.0.1"),
    ],
)
def test_the_client_address_is_read_from_the_proxies_end_of_the_header(settings, proxies, forwarded, client):
    settings.TRUSTED_PROXY_COUNT = proxies
    assert address_seen(forwarded) == client


@pytest.mark.django_db
def test_behind_a_proxy_one_clients_failed_logins_lock_that_client_alone(settings):
    settings.TRUSTED_PROXY_COUNT = 1
    settings.LOGIN_FAILURES_PER_ADDRESS = 3
    name = f"ops-{uuid.uuid4().hex[:8]}"
    User.objects.create_user(name, password="the-right-password", is_staff=True)
    guesser, colleague = f"198.51.100.{uuid.uuid4().int % 250 + 1}", f"203.0.113.{uuid.uuid4().int % 250 + 1}"

    def login(password: str, user: str, client_address: str) -> str:
        client = Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=client_address)  # all through the proxy
        page = client.post("/admin/login/?next=/admin/", {"username": user, "password": password})
        return "in" if "_auth_user_id" in client.session else page.content.decode()

    for n in range(3):
        assert "correct username and password" in login("guess", f"nobody-{n}", guesser)
    assert "every login from it is refused" in login("the-right-password", name, guesser)
    assert login("the-right-password", name, colleague) == "in"
