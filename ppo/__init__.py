"""The toolkit's shared package. Importing it first defers PaddleNLP's unused subpackages
(`ppo.common.lazy_paddlenlp`): every entry point starts about a third faster."""
from ppo.common.lazy_paddlenlp import defer_on_import

defer_on_import()
