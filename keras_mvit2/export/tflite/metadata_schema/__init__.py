"""TFLite Model Metadata schema (``metadata_schema.fbs``) and its generated Python code.

See README.md in this folder for the source, the licence and the generator command.
"""
