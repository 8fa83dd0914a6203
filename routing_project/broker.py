"""The embedded broker: kombu's filesystem transport, with messages that appear whole.

kombu's own transport creates a message file in the folder the workers read and then writes
into it. A worker polling in between takes the still empty file, cannot decode it, and stops
("Unrecoverable error: JSONDecodeError"): under a burst of intake with SLA timers it took the
routing worker down, and `scripts/run.sh` the whole product with it. Here a message is
written under a name no queue reads and renamed into place once complete (a rename within
one folder is atomic), so a reader sees either no message or all of it.

kombu's reader also lists and sorts the whole folder for every message it takes: with a
backlog (the e-mails of a bulk import: one message per assigned lead) that is quadratic, and
the notifications worker spent a core listing 17,000 files to take 20 messages a second.
Here a reader lists the folder once for all its queues and takes each queue's messages in
order from that listing; it lists again when a queue it is asked for has none left, at most
every RELIST_EVERY_S (a worker also polls queues that stay empty: its remote-control queue).

Selected by `CELERY_BROKER_TRANSPORT` when the broker URL is `filesystem://` (settings).
"""

import contextlib
import os
import shutil
import tempfile
import uuid
from collections import deque
from queue import Empty
from time import monotonic, monotonic_ns
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

# A message published after a listing waits at most this long for the next (plus the
# worker's polling interval, 0.2 s).
RELIST_EVERY_S = 0.1


class Channel(filesystem.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._pending: dict[str, deque[str]] = {}  # per queue, the names listed and not taken yet
        self._listed_at = float("-inf")
        super().__init__(*args, **kwargs)

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        """Put `payload` onto `queue`, only once written. The readers take the files in name
        order: the name starts with the publication time, to the nanosecond (kombu's, to the
        millisecond, left the messages of one millisecond in random order)."""
        name = f"{monotonic_ns():020d}_{uuid.uuid4()}.{queue}.msg"
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

    def _get(self, queue: str) -> Any:
        """Take the next message of `queue`, in name order (publication time)."""
        if not self._pending.get(queue) and monotonic() - self._listed_at >= RELIST_EVERY_S:
            self._list_folder()
        pending = self._pending.get(queue) or deque()
        processed = self.processed_folder if self.store_processed else tempfile.gettempdir()
        while pending:
            name = pending.popleft()
            try:
                shutil.move(os.path.join(self.data_folder_in, name), processed)
            except OSError:
                continue  # taken by another reader of this queue meanwhile
            path = os.path.join(processed, name)
            try:
                with open(path, "rb") as f:
                    payload = f.read()
                if not self.store_processed:
                    os.remove(path)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {path!r} from queue.") from exc
            return loads(bytes_to_str(payload))
        raise Empty()

    def _list_folder(self) -> None:
        """Every queue's messages, by name: "<time>_<uuid>.<queue>.msg"."""
        by_queue: dict[str, list[str]] = {}
        for name in os.listdir(self.data_folder_in):
            if name.endswith(".msg") and "." in name[:-4]:
                by_queue.setdefault(name[:-4].split(".", 1)[1], []).append(name)
        self._pending = {queue: deque(sorted(names)) for queue, names in by_queue.items()}
        self._listed_at = monotonic()


class Transport(filesystem.Transport):
    Channel = Channel
