import getpass
import signal
import threading
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from leads.bulk import (
    BATCH_SIZE,
    MAX_BATCH_SIZE,
    MAX_ERRORS_KEPT,
    ImportFormatError,
    csv_text,
    encoding_codec,
    encoding_problem,
    interrupt,
    leads_import,
    new_import_id,
    scan,
)


class Terminated(KeyboardInterrupt):
    """A TERM (`kill`, a service manager) ends the import as Ctrl-C does: the batch in progress
    rolled back, the reader process stopped, and what is in said."""


def _terminated(signum: int, frame: Any) -> None:
    interrupt(Terminated())  # now, or once the batch committing is counted


def _interrupted(signum: int, frame: Any) -> None:
    interrupt(KeyboardInterrupt())


class Command(BaseCommand):
    help = (
        "Imports and routes the leads of a CSV file (header: the API's lead fields, plus "
        "attributes.<key> columns), in UTF-8 unless --encoding names another. Streams the file, "
        "reports bad rows by line number and "
        "imports the rest; rows whose external_id was imported already are skipped (those that "
        "repeat an earlier row of the file are listed with its line, those whose values differ from "
        "the lead with the fields that differ). Exit status: "
        "0 when the file was read to its end (bad rows, if any, are listed on stderr and counted "
        "in the summary); 1 when the file cannot be imported (missing, unreadable, empty, bad header) or an "
        "error stopped the import; 130 when interrupted (Ctrl-C), 143 when stopped by a TERM: the "
        "batches committed before stay, and running the same file again imports the rest."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)
        parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="Leads per locked transaction.")
        parser.add_argument(
            "--encoding",
            default="utf-8",
            help=(
                "The file's text encoding (default utf-8). Excel's \"CSV (Comma delimited)\" is cp1252 in "
                "Western Europe and the Americas; also cp1250, cp1251, mac_roman, or any other "
                "ASCII-compatible encoding Python knows."
            ),
        )
        parser.add_argument("--no-notify", action="store_true", help="Send no webhooks or e-mails for these leads.")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
        parser.add_argument("--no-parallel", action="store_true", help="Validate in a thread, not in a second process.")
        parser.add_argument(
            "--show-errors",
            type=int,
            default=50,
            help=(
                "How many bad rows, rows repeating an earlier row's external_id, and rows differing from "
                f"the lead their external_id names, to print (at most {MAX_ERRORS_KEPT} of each are kept)."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            return self._import(**options)  # signals reach the main thread only
        previous = signal.signal(signal.SIGTERM, _terminated), signal.signal(signal.SIGINT, _interrupted)
        try:
            return self._import(**options)
        finally:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])

    def _import(self, **options: Any) -> None:
        path: Path = options["file"]
        if not path.exists():
            raise CommandError(f"No such file: {path}")
        if not path.is_file():
            raise CommandError(f"Not a file: {path}")
        if not 1 <= options["batch_size"] <= MAX_BATCH_SIZE:
            # A batch holds a lock per lead (its email's) until it commits, in PostgreSQL's lock
            # table, which every session shares: 20,000 ran it out of memory, and intake and
            # the workers failed with it.
            raise CommandError(
                f"--batch-size must be from 1 to {MAX_BATCH_SIZE:,}: a batch holds a lock per lead until it "
                "commits, in the lock table every database session shares."
            )
        if options["show_errors"] < 0:
            raise CommandError("--show-errors must be 0 or more.")
        try:
            encoding = encoding_codec(options["encoding"])
        except ValueError as exc:
            raise CommandError(f"--encoding: {exc}") from None
        actor = f"import:{getpass.getuser()}:{path.name}"
        started = time.perf_counter()
        try:
            # Read to its end before anything is written: a file that cannot be read stops here.
            scanned = scan(str(path))
        except OSError as exc:
            raise CommandError(f"Cannot read {path}: {exc.strerror or exc}") from exc
        except KeyboardInterrupt as exc:
            raise CommandError("Interrupted before anything was imported.", returncode=_status(exc)) from None
        if refused := encoding_problem(scanned, encoding):
            if refused.instead == "utf-8":
                raise CommandError(f"{refused.message} Leave out --encoding.")
            if refused.choices:
                raise CommandError(
                    f"{refused.message} Import it with --encoding set to the one that reads right "
                    f'({", ".join(refused.choices)}, or its own), or save it as "CSV UTF-8".'
                )
            raise CommandError(refused.message)
        total = scanned.rows
        bar = tqdm(
            total=total,
            unit="row",  # every row read, a bad one too (the summary counts the leads)
            unit_scale=False,  # whole rows (scaled, a small file read "0.00/2.00")
            disable=options["no_progress"],
            file=self.stderr._out,
        )
        committed = 0
        import_id = new_import_id()  # named however the import ends: its lines and events carry it

        def progress(rows: int) -> None:
            nonlocal committed
            committed += rows
            bar.update(rows)

        try:
            with open(path, "rb") as f:
                report = leads_import(
                    lines=csv_text(f, encoding),
                    actor=actor,
                    batch_size=options["batch_size"],
                    notify_reps=not options["no_notify"],
                    progress=progress,
                    parallel=not options["no_parallel"],
                    import_id=import_id,
                    encoding=encoding,
                )
            # The total was counted in lines: a quoted cell over several lines, or a blank line,
            # is not a row of its own. The bar ends at the rows read, full.
            bar.total = report.rows
        except ImportFormatError as exc:
            raise CommandError(str(exc)) from exc
        except KeyboardInterrupt as exc:
            # Each batch is its own transaction: say what is in, not a traceback.
            raise CommandError(f"Interrupted: {self._so_far(committed, import_id)}", returncode=_status(exc)) from None
        except Exception as exc:
            # A database error past the retries (a rotation row held too long, the server gone):
            # as the admin upload says it. --traceback shows the whole of it.
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            problem = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
            raise CommandError(f"The import stopped ({problem}): {self._so_far(committed, import_id)}") from exc
        finally:
            bar.close()
        elapsed = time.perf_counter() - started
        # At most MAX_ERRORS_KEPT bad rows are kept: what was not printed is counted, whatever
        # --show-errors asked for.
        shown = report.errors[: options["show_errors"]]
        for error in shown:
            self.stderr.write(str(error))
        if report.invalid > len(shown):
            self.stderr.write(f"... and {report.invalid - len(shown)} more bad rows")
        repeats = report.repeats[: options["show_errors"]]
        for repeat in repeats:
            self.stderr.write(str(repeat))
        if report.repeated > len(repeats):
            self.stderr.write(f"... and {report.repeated - len(repeats)} more rows repeating an earlier line")
        changes = report.changes[: options["show_errors"]]
        for change in changes:
            self.stderr.write(str(change))
        if report.changed > len(changes):
            self.stderr.write(f"... and {report.changed - len(changes)} more rows differing from their lead")
        rate = report.rows / elapsed if elapsed else 0
        self.stdout.write(f"{report.summary()} in {elapsed:.1f} s ({rate:.0f} rows/s), import id {report.import_id}")

    @staticmethod
    def _so_far(committed: int, import_id: str) -> str:
        return (
            f"the first {committed} rows are imported (their batches were committed, import id "
            f"{import_id}), the batch in progress was rolled back. Run the same file again to import "
            "the rest: rows whose external_id is already imported are skipped. Rows without an external_id "
            "are taken in again: as duplicates of the leads they made while those are open and within their "
            "group's dedup window, else as new leads."
        )


def _status(interrupt: KeyboardInterrupt) -> int:
    """The shell's status for the signal that stopped the import: 128 + its number."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)
