from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the two kinds of build job with the job runner."""
        from .models import BuildJob
        from .services.jobs import JobKind, register

        cartridge = JobKind("fleet.services.cartridges.run_cartridge_job", "fleet.build_cartridge")
        register(BuildJob.Kind.CARTRIDGE, cartridge)
        register(BuildJob.Kind.FLEET, JobKind("fleet.services.fleets.run_fleet_job", "fleet.build_fleet"))
