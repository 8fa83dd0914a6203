import factory

from leads.models import ApiClient
from rotation.models import Group, Membership, Rep, RotationState


class GroupFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Group
        django_get_or_create = ("slug",)
        skip_postgeneration_save = True

    slug = factory.Sequence(lambda n: f"group-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.replace("-", " ").title())
    strategy = "round_robin"

    @factory.post_generation
    def rotation(obj, create, extracted, **kwargs):  # noqa: N805
        if create:
            RotationState.objects.get_or_create(group=obj)


class RepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Rep

    name = factory.Sequence(lambda n: f"Rep {n}")
    email = factory.Sequence(lambda n: f"rep{n}@sales.example")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    group = factory.SubFactory(GroupFactory)
    rep = factory.SubFactory(RepFactory)
    position = factory.Sequence(lambda n: n)
    weight = 1


def api_client_with(scopes: list[str], name: str | None = None) -> tuple[ApiClient, str]:
    from leads.tokens import api_client_create

    return api_client_create(name=name or f"client-{'-'.join(scopes)}-{ApiClient.objects.count()}", scopes=scopes)
