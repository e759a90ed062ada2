"""A request body the way the decision reads it: the JSON decoded once, and every way it can
be malformed an ``ApiError`` 400 that names the problem (the gateway answers it at once),
never a Python exception's text.

``engine_advisor.service.proxy.request.decode`` (the proxy's and ``/v1/route``'s decoder) already
answers 400 for bytes that are not UTF-8 JSON; this adds what its scanner raises beyond that:
nesting deeper than the interpreter's recursion limit (``RecursionError``) and an integer longer
than ``sys.get_int_max_str_digits()`` digits (a plain ``ValueError``).
"""

from __future__ import annotations

import sys
from typing import Any

from engine_advisor.service.errors import ApiError
from engine_advisor.service.proxy.request import decode

NESTED = "request body: JSON nested too deeply to read"


def load(raw: bytes) -> Any:
    try:
        return decode(raw)
    except RecursionError:
        raise ApiError(400, NESTED) from None
    except ValueError:          # decode() maps JSONDecodeError itself: what is left is this
        raise ApiError(400, "request body: a number with more than "
                            f"{sys.get_int_max_str_digits()} digits") from None
