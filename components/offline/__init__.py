"""Offline plans: run the real program under Pulumi's mock runtime and write what it registers."""
