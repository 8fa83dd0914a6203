"""Email domains as accounts and rules compare them."""

import unicodedata

import idna


def domain_ascii(domain: str) -> str:
    """A domain in ASCII, as lead addresses are stored: IDNA 2008 as browsers and mail
    systems read it (UTS 46, non-transitional), so `straße.de` is `xn--strae-oqa.de`, not
    `strasse.de`, another domain (Python's own codec is IDNA 2003, which maps ß to ss, final
    sigma to sigma and drops joiners). What IDNA 2008 forbids (a symbol such as ☃) is encoded
    as IDNA 2003 does. UnicodeError when neither can."""
    try:
        return idna.encode(domain, uts46=True, transitional=False).decode("ascii")
    except idna.IDNAError:
        return domain.encode("idna").decode("ascii")


def domain_unicode(domain: str) -> str:
    """A domain as rules and accounts compare it: lower case, its IDNA labels (`xn--…`) read
    back to Unicode, so `bücher.example` and `xn--bcher-kva.example` are one domain (lead
    addresses are stored in ASCII: `ascii_email`). DNS's final dot ("acme.example.") is dropped:
    no address ends with it, so a domain kept with it would never match a lead."""
    domain = domain.strip().lower().removesuffix(".")
    if not domain.isascii():
        # As a lead's address reads back from its ASCII form: an accented letter as one
        # character (NFC), whether it was typed so or as a letter and a combining mark.
        try:
            return idna.decode(domain_ascii(domain))
        except UnicodeError:
            return unicodedata.normalize("NFC", domain)
    if "xn--" not in domain:
        return domain
    try:
        return idna.decode(domain)
    except UnicodeError:  # idna.IDNAError is one
        pass
    try:
        return domain.encode("ascii").decode("idna")
    except UnicodeError:
        return domain
