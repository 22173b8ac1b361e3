"""Query and path parameter types that the database can hold, checked at the edge.

A parameter the storage layer cannot take (an id beyond int64, a time without a zone to
compare with stored UTC times) is a 422 naming the parameter, not a 500 from the driver.
Not for bodies: their models carry their own bounds.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path
from pydantic import AwareDatetime

INT64_MAX = (1 << 63) - 1

# A row id in a path (`/v1/alerts/{alert_id}/clear`): autoincrement ids start at 1.
RowId = Annotated[int, Path(ge=1, le=INT64_MAX)]

# A time in a query (`?since=`): it must carry its zone (`Z` or `+02:00`).
ZonedTime = AwareDatetime

__all__ = ["INT64_MAX", "RowId", "ZonedTime"]
