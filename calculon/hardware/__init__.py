"""Hardware models: processors, memory tiers, network tiers, the system.

Every method accepts numpy arrays (any broadcastable shapes) as well as
scalars, so one call prices an operation for one execution or for millions.
"""

from calculon.hardware.processor import Processor
from calculon.hardware.memory import Memory
from calculon.hardware.network import Network, Networks
from calculon.hardware.system import System

__all__ = ['Processor', 'Memory', 'Network', 'Networks', 'System']
