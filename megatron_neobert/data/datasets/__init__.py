"""At training time, ``.bin/.idx`` to batches: the MLM dataset and its cache (``mlm_dataset``), the layout
(``packing``), the corpus's document table (``documents``), the data checks, blends, the trainer's datasets from its
settings, the batches (``batches``) and the torch and DALI loaders. Imports the data floor (tokenizer, indexed,
records), never the preprocessing."""
