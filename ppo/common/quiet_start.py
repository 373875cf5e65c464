"""Start-up of the entry scripts: third-party import warnings held back and logged at debug level.

Importing Paddle and PaddleNLP warns about things a user cannot act on (no ccache for the
C++ extension builder, setuptools replacing distutils, deprecations inside the libraries).
The entry scripts import them inside `quiet_third_party_warnings()`; each distinct warning
is logged once at debug level (`logging.getLogger("ppo")`), so nothing is lost; so is
PaddleNLP's start-up notice about `report_to`'s future default.
"""
import logging
import warnings
from contextlib import contextmanager

logger = logging.getLogger("ppo")


@contextmanager
def quiet_third_party_warnings():
    """Hold back the warnings raised in the block and log each distinct one once at debug level."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        install_paddlenlp_notice_filter()
    for text in dict.fromkeys(f"{w.category.__name__} ({w.filename}:{w.lineno}): {w.message}" for w in caught):
        logger.debug(f"warning while importing: {text}")


PADDLENLP_NOTICES = ("The default value for the training argument `--report_to` will change in v5",)
"""Messages PaddleNLP logs at INFO on every start that say nothing about this run."""


class PaddleNLPNoticeFilter(logging.Filter):
    """Moves `PADDLENLP_NOTICES` from PaddleNLP's console logger to ours at debug level."""

    def filter(self, record):
        text = record.getMessage()
        if text.startswith(PADDLENLP_NOTICES):
            logger.debug(f"PaddleNLP: {text}")
            return False
        return True


def install_paddlenlp_notice_filter():
    """Attach `PaddleNLPNoticeFilter` to PaddleNLP's logger once (no-op without PaddleNLP)."""
    try:
        from paddlenlp.utils.log import logger as paddlenlp_logger
    except ImportError:
        return
    target = paddlenlp_logger.logger
    if not any(isinstance(f, PaddleNLPNoticeFilter) for f in target.filters):
        target.addFilter(PaddleNLPNoticeFilter())
