"""Pass pipelines and transform scripts for code generation (data files, read by blade.codegen)."""
