"""Reading results: tables, plots, compare, advise, validation and the papers replay (the top layer)."""
