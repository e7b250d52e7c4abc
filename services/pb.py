"""Every tributary.v1 message and enum in one namespace, imported as ``pb`` from :mod:`services.proto`.

Star imports rather than a namespace filled at run time, so that type checkers see each message
through the ``.pyi`` stubs that ``tributary-codegen`` writes beside the generated modules.  No two
modules define the same message or enum name (``DESCRIPTOR``, which every module has, is not
one to use from here).
"""

from tributary.v1.admin_pb2 import *  # noqa: F403
from tributary.v1.common_pb2 import *  # noqa: F403 -- the namespace is the point of this module
from tributary.v1.coordinator_pb2 import *  # noqa: F403
from tributary.v1.gateway_pb2 import *  # noqa: F403
from tributary.v1.groups_pb2 import *  # noqa: F403
from tributary.v1.storage_pb2 import *  # noqa: F403
from tributary.v1.transactions_pb2 import *  # noqa: F403
