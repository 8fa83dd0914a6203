"""A configuration change under load, against gunicorn as production runs it: intake starts on
each process's cached configuration and checks its version in the routing transaction
(routing_project/configcache.py), so a token revoked while clients post is refused from its
commit on, batches included, and nothing routed is lost or doubled."""

import http.client
import json
import threading
import time
from collections import Counter

import pytest

from leads.models import ApiClient, Lead
from tests.factories import api_client_with

from .webserver import gunicorn, live_database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("web-server")]


def test_a_token_revoked_under_load_routes_nothing_after_its_commit(make_group, tmp_path):
    group, reps = make_group(3, slug="hot")
    client, token = api_client_with(["intake"])
    env = {
        "DATABASE_URL": live_database_url(),
        "WEB_WORKERS": "2",
        "WEB_THREADS": "4",
    }
    results: list[tuple[float, float, int]] = []  # (sent, answered, status), time.time()
    sent_at: dict[str, float] = {}  # email: when its request was sent
    lock = threading.Lock()
    stop = threading.Event()

    with gunicorn(tmp_path, **env) as server:

        def clients(index: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            n = 0
            while not stop.is_set() and n < 2000:
                body = json.dumps({"email": f"load{index}-{n}@customer.example", "group": "hot"})
                sent = time.time()
                sent_at[f"load{index}-{n}@customer.example"] = sent
                conn.request("POST", "/api/v1/leads/", body, headers)
                response = conn.getresponse()
                response.read()
                with lock:
                    results.append((sent, time.time(), response.status))
                n += 1
            conn.close()

        threads = [threading.Thread(target=clients, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(1.5)  # every worker routes with this token cached
        ApiClient.objects.filter(pk=client.pk).update(active=False)  # committed when it returns
        revoked_at = time.time()
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(60)

    statuses = Counter(status for _, _, status in results)
    assert set(statuses) <= {201, 401}, statuses
    before = [r for r in results if r[1] < revoked_at]
    after = [r for r in results if r[0] > revoked_at]
    assert before and all(status == 201 for _, _, status in before)
    assert after and all(status == 401 for _, _, status in after), Counter(s for _, _, s in after)
    # Every 201 is a lead, one each, none from a request sent after the revocation's commit (a
    # request in flight across the commit, authenticated before it, may still be taken in).
    leads = list(Lead.objects.filter(api_client_id=client.pk))
    assert len(leads) == statuses[201]
    assert all(sent_at[lead.email] < revoked_at for lead in leads)
    counts = Counter(lead.owner_id for lead in leads)
    assert set(counts) == {rep.id for rep in reps} and max(counts.values()) - min(counts.values()) <= 1
