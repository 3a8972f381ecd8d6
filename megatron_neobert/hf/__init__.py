"""NeoBERT as a transformers model, in transformers' own layout: `modular_neobert.py` (the source),
`configuration_neobert.py` and `modeling_neobert.py` (generated from it by transformers' modular converter:
tests/hf_modular.py).

`import megatron_neobert.hf` registers `neobert` with transformers' Auto classes, so NeoBERT folders (ours and the
published `chandar-lab/NeoBERT` layout, whose `auto_map` names remote code) load with `trust_remote_code=False`.
"""

from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForMultipleChoice,
                          AutoModelForQuestionAnswering, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification)

from .configuration_neobert import NeoBERTConfig
from .modeling_neobert import (NeoBERT, NeoBERTForMultipleChoice, NeoBERTForQuestionAnswering,
                               NeoBERTForSequenceClassification, NeoBERTForTokenClassification, NeoBERTLMHead,
                               NeoBERTPreTrainedModel)

AUTO_CLASSES = {
    AutoModel: NeoBERT,
    AutoModelForMaskedLM: NeoBERTLMHead,
    AutoModelForSequenceClassification: NeoBERTForSequenceClassification,
    AutoModelForTokenClassification: NeoBERTForTokenClassification,
    AutoModelForQuestionAnswering: NeoBERTForQuestionAnswering,
    AutoModelForMultipleChoice: NeoBERTForMultipleChoice,
}


def register() -> None:
    """Registers `neobert` with AutoConfig and the Auto model classes (idempotent)."""
    AutoConfig.register(NeoBERTConfig.model_type, NeoBERTConfig, exist_ok=True)
    for auto_class, model_class in AUTO_CLASSES.items():
        auto_class.register(NeoBERTConfig, model_class, exist_ok=True)


register()

__all__ = ["AUTO_CLASSES", "NeoBERT", "NeoBERTConfig", "NeoBERTForMultipleChoice", "NeoBERTForQuestionAnswering",
           "NeoBERTForSequenceClassification", "NeoBERTForTokenClassification", "NeoBERTLMHead",
           "NeoBERTPreTrainedModel", "register"]
