"""Start-up of the entry scripts: third-party import warnings held back and logged at debug level.

Importing Paddle and PaddleNLP warns about things a user cannot act on (no ccache for the
C++ extension builder, setuptools replacing distutils, deprecations inside the libraries).
The entry scripts import them inside `quiet_third_party_warnings()`; each distinct warning
is logged once at debug level (`logging.getLogger("ppo")`), so nothing is lost; so are
PaddleNLP's start-up notices, its debug lines and the lines that repeat a model load or save
(`PADDLENLP_NOTICES`).
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


PADDLENLP_NOTICES = (
    "The default value for the training argument `--report_to` will change in v5",
    # a model load: "Loading weights file PATH" is its one line; these repeat it
    "We are using <class ", "Loading configuration file ", "Loaded weights file from disk",
    "All model checkpoint weights were used", "All the weights of ",
    # a save: "Model weights saved in PATH" is its one line
    "Configuration saved in ", "tokenizer config file saved in ", "Special tokens file saved in ",
    "The global seed is set to ", "max_steps is given, it will override", "[timelog] ",
)
"""Messages PaddleNLP logs at INFO that say nothing new about this run (start-up notices, the
lines around the one line of each model load and save, the seed that resolved_arguments.json
holds)."""


class PaddleNLPNoticeFilter(logging.Filter):
    """Moves `PADDLENLP_NOTICES` and PaddleNLP's debug lines (its Trainer prints every training
    argument at debug level: resolved_arguments.json holds them) from PaddleNLP's console logger
    to ours at debug level."""

    def filter(self, record):
        text = record.getMessage()
        if record.levelno < logging.INFO or text.startswith(PADDLENLP_NOTICES):
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
