"""Small, obviously-correct pure-Python references the native engine is tested against."""
