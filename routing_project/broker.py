"""The embedded broker: kombu's filesystem transport, with messages that appear whole.

kombu's own transport creates a message file in the folder the workers read and then writes
into it. A worker polling in between takes the still empty file, cannot decode it, and stops
("Unrecoverable error: JSONDecodeError"): under a burst of intake with SLA timers it took the
routing worker down, and `scripts/run.sh` the whole product with it. Here a message is
written under a name no queue reads and renamed into place once complete (a rename within
one folder is atomic), so a reader sees either no message or all of it.

Selected by `CELERY_BROKER_TRANSPORT` when the broker URL is `filesystem://` (settings).
"""

import contextlib
import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        """Put `payload` onto `queue`: named as kombu names it (the readers take the files
        in name order), but only once written."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot and no ".<queue>.msg" in it: no reader takes it, none counts it.
        partial = os.path.join(self.data_folder_out, f".{uuid.uuid4()}.partial")
        data = str_to_bytes(dumps(payload))
        try:
            with open(partial, "wb") as f:
                f.write(data)
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
