"""Rego decisions on identities: engines, policy versions, impact reports, explanations."""
