"""Spend: prices, the ledger of every request's tokens and cost, budgets per key and team (docs/spend.md)."""
