"""`manage.py measure_escalation` empties its Redis database: it refuses one that holds keys
(a live broker's queued timers and deliveries) unless told to."""

import pytest
import redis
from django.core.management import CommandError, call_command

from rotation.models import Group


@pytest.mark.django_db
def test_it_refuses_a_redis_database_that_holds_keys_and_deletes_nothing(private_redis, settings):
    client = redis.Redis.from_url(private_redis.url)
    client.set("unacked_index", "a live broker's")
    settings.CELERY_BROKER_URL = private_redis.url
    with pytest.raises(CommandError, match=r"holds 1 keys.*--flush-redis"):
        call_command("measure_escalation", "--pending", "0", "--skip-delay")
    assert client.get("unacked_index") == b"a live broker's"
    assert not Group.objects.filter(slug="measure-escalation").exists()  # nor wrote anything
