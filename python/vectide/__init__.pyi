from ._vectide import CorruptIndexError as CorruptIndexError
from ._vectide import Index as Index
from ._vectide import __version__ as __version__
from ._vectide import simd_isa as simd_isa
from ._vectide import allocator as allocator
from ._vectide import LIMITS as LIMITS

MISSING_ID: int
from ._vectide import DatabaseLockedError as DatabaseLockedError
from ._vectide import PoisonedError as PoisonedError
from .db import Collection as Collection
from .db import Database as Database
from .db import connect as connect
from .client import Client as Client
