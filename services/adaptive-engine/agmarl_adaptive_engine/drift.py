"""Page-Hinkley drift detection: the implementation lives in ``agmarl_common.core.adaptive.drift``
(with ADWIN, PSI/KL and the hysteresis switch); re-exported here for existing callers."""

from agmarl_common.core.adaptive.drift import PageHinkley, ph_update

__all__ = ["PageHinkley", "ph_update"]
