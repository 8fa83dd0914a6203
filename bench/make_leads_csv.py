"""Writes a test CSV of leads for `manage.py import_leads` (streamed, any size).

    .venv/bin/python -m bench.make_leads_csv var/leads-100k.csv --rows 100000 --group bulk

Columns: the API's lead fields and two attributes; every row has a unique external_id and
email, so a re-run of the import imports nothing new. `--bad-every N` makes every Nth row
invalid (a bad email), to see the line-numbered report.
"""

import argparse
import csv
import random

COUNTRIES = ["FR", "DE", "GB", "US", "ES", "IT", "NL", "BE", "SE", "PL"]
SOURCES = ["web", "webinar", "partner", "ads", "event"]
PRODUCTS = ["core", "pro", "enterprise"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--group", default="", help="The group column (used when no rule matches).")
    parser.add_argument("--prefix", default="bulk", help="Prefix of external ids and emails.")
    parser.add_argument("--bad-every", type=int, default=0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    header = [
        "external_id",
        "email",
        "first_name",
        "last_name",
        "company",
        "phone",
        "country",
        "source",
        "product",
        "score",
        "company_size",
        "group",
        "attributes.campaign",
        "attributes.newsletter",
    ]
    with open(args.path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for i in range(args.rows):
            bad = args.bad_every and (i + 1) % args.bad_every == 0
            writer.writerow(
                [
                    f"{args.prefix}-{i}",
                    f"not-an-email-{i}" if bad else f"{args.prefix}.{i}@customer{i % 997}.example",
                    f"First{i}",
                    f"Last{i}",
                    f"Company {i % 5000}",
                    f"+33 1 {i:08d}",
                    rnd.choice(COUNTRIES),
                    rnd.choice(SOURCES),
                    rnd.choice(PRODUCTS),
                    rnd.randint(0, 100),
                    rnd.randint(1, 50_000),
                    args.group,
                    f"spring-{i % 12}",
                    rnd.choice(["true", "false"]),
                ]
            )


if __name__ == "__main__":
    main()
