"""Explaining a trained model: which tokens its answer rests on (`ranking`, one text;
`faithfulness`, the erasure tests over a split), its attention maps (`maps`), and the pictures
and the HTML page that show them (`plots`, `step_plots`, `page`).
"""
