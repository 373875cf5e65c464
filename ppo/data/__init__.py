"""Data layer: raw samples and the raw-dataset registry, the four tokenised dataset
kinds and their collators (PaddleNLP `llm/alignment/ppo/data` / safe-rlhf shape).

Importing this package registers the built-in raw datasets: `PKU-SafeRLHF/train`
(aliases `PKU-SafeRLHF`, `safe-rlhf`), `PKU-SafeRLHF/test`, `PKU-SafeRLHF/safety`,
`PKU-SafeRLHF/safety/test`, `alpaca`, `Jsonfile`, `json`, `paddlenlp-dpo` (PaddleNLP's DPO format),
`paddlenlp-ranked`, `paddlenlp-unpaired` and `trl-unpaired` (`feedback_formats.py`), `paddlenlp-prm`
(Math-Shepherd's step-labelled records, `process_reward.py`), and TRL's formats
`trl-preference`, `trl-messages`, `trl-prompt` (`trl_formats.py`); all read local
files. A dataset name that is a path to a .json/.jsonl file (`ppo-kk/train.jsonl`)
reads that file as `Jsonfile`, as PaddleNLP's `train_datasets` does.
"""
from .base import (
    DEFAULT_TEMPLATE,
    IGNORE_INDEX,
    PROMPT_ASSISTANT,
    PROMPT_BEGIN,
    PROMPT_INPUT,
    PROMPT_USER,
    DataError,
    RawDataset,
    RawSample,
    UnknownDatasetError,
    sample_conversation,
)
from .collate import CollatorBase, format_prompt, left_padding, position_ids_from_mask, right_padding
from .specs import DatasetSpec, parse_dataset, parse_dataset_spec
from .tokenized import TokenizedDataset, merge_raw_datasets, mix_raw_datasets
from .readers import LocalFileDataset, Record, read_records, resolve_path
from .safe_rlhf import (
    SafeRLHFDataset,
    SafeRLHFSafetyDataset,
    SafeRLHFSafetyTestDataset,
    SafeRLHFSafetyTrainDataset,
    SafeRLHFTestDataset,
    SafeRLHFTrainDataset,
)
from .alpaca import AlpacaDataset
from .jsonfile import JsonDataset
from .paddlenlp_dpo import PaddleNLPPreferenceDataset
from .raw_json import RawJsonDataset
from .supervised import SupervisedCollator, SupervisedDataset
from .preference import PreferenceCollator, PreferenceDataset
from .safety_preference import SafetyPreferenceCollator, SafetyPreferenceDataset
from .prompt_only import PromptOnlyCollator, PromptOnlyDataset
from .feedback_formats import PaddleNLPRankedDataset, PaddleNLPUnpairedDataset, TRLUnpairedDataset
from .answer_sets import (
    PREFERENCE_DATASETS,
    AnswerSetCollator,
    RankedPreferenceDataset,
    RejectedOnlyDataset,
    UnpairedPreferenceDataset,
)
from .demo import DEMO_TEMPLATE, demo_dataset_specs
from .trl_formats import TRLMessagesDataset, TRLPreferenceDataset, TRLPromptDataset
from .process_reward import PRM_DATASET, ProcessRewardCollator, ProcessRewardDataset, ProcessRewardRawDataset

__all__ = [
    "PRM_DATASET",
    "ProcessRewardCollator",
    "ProcessRewardDataset",
    "ProcessRewardRawDataset",
    "PREFERENCE_DATASETS",
    "AnswerSetCollator",
    "RankedPreferenceDataset",
    "RejectedOnlyDataset",
    "UnpairedPreferenceDataset",
    "PaddleNLPRankedDataset",
    "PaddleNLPUnpairedDataset",
    "TRLUnpairedDataset",
    "PaddleNLPPreferenceDataset",
    "DEFAULT_TEMPLATE",
    "DEMO_TEMPLATE",
    "IGNORE_INDEX",
    "PROMPT_ASSISTANT",
    "PROMPT_BEGIN",
    "PROMPT_INPUT",
    "PROMPT_USER",
    "AlpacaDataset",
    "CollatorBase",
    "DataError",
    "DatasetSpec",
    "JsonDataset",
    "LocalFileDataset",
    "PreferenceCollator",
    "PreferenceDataset",
    "PromptOnlyCollator",
    "PromptOnlyDataset",
    "RawDataset",
    "RawJsonDataset",
    "RawSample",
    "Record",
    "SafeRLHFDataset",
    "SafeRLHFSafetyDataset",
    "SafeRLHFSafetyTestDataset",
    "SafeRLHFSafetyTrainDataset",
    "SafeRLHFTestDataset",
    "SafeRLHFTrainDataset",
    "SafetyPreferenceCollator",
    "SafetyPreferenceDataset",
    "SupervisedCollator",
    "SupervisedDataset",
    "TokenizedDataset",
    "TRLMessagesDataset",
    "TRLPreferenceDataset",
    "TRLPromptDataset",
    "UnknownDatasetError",
    "demo_dataset_specs",
    "format_prompt",
    "left_padding",
    "merge_raw_datasets",
    "mix_raw_datasets",
    "parse_dataset",
    "parse_dataset_spec",
    "position_ids_from_mask",
    "read_records",
    "resolve_path",
    "right_padding",
    "sample_conversation",
]
