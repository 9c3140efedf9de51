"""The book's own machinery."""
