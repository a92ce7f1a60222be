"""A password hasher for the tests' own users: Django's PBKDF2 with one iteration.

Nearly every test makes a user or two, and Django's 1,000,000 iterations cost a quarter of a second of CPU each:
minutes of a whole run on the 2-core CI machine. The algorithm keeps its name, and PBKDF2 reads the iterations
from the stored hash, so a server the tests start in a process of its own, with the stock hashers, still checks
these passwords (and, at a sign-in, stores them again at the full count, as it would any old hash).
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2(PBKDF2PasswordHasher):
    iterations = 1
