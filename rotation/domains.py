"""Email domains as accounts and rules compare them."""

import unicodedata


def domain_unicode(domain: str) -> str:
    """A domain as rules and accounts compare it: lower case, its IDNA labels (`xn--…`) read
    back to Unicode, so `bücher.example` and `xn--bcher-kva.example` are one domain (lead
    addresses are stored in ASCII: `ascii_email`). DNS's final dot ("acme.example.") is dropped:
    no address ends with it, so a domain kept with it would never match a lead."""
    domain = domain.strip().lower().removesuffix(".")
    if not domain.isascii():
        # An accented letter as one character (NFC), as a lead's address reads back from its
        # ASCII form, whether it was typed so or as a letter and a combining mark.
        return unicodedata.normalize("NFC", domain)
    if "xn--" not in domain:
        return domain
    try:
        return domain.encode("ascii").decode("idna")
    except UnicodeError:
        return domain
