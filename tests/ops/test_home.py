"""The server's own address (printed by make run, linked as the admin's "View site") leads
somewhere: the admin."""

import pytest


@pytest.mark.django_db
def test_the_root_address_leads_to_the_admin(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    assert client.get("/", follow=True).status_code == 200  # the admin's login page
