"""A simulated Kubernetes API server (aiohttp), faithful enough for kubectl and kubernetes-asyncio.

Why it exists: no kube-apiserver can run where gpuscale is tested and demonstrated, yet the code that reads and
writes Kubernetes must be exercised over real HTTP, with real clients (kubectl v1.32, kubernetes-asyncio). This
module is a general-purpose stand-in: nothing in it knows about gpuscale, and product code never special-cases it.

What is faithful (the things clients and controllers depend on):

* Discovery: ``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>[/<version>]`` (legacy, not
  aggregated, discovery; kubectl falls back to it), with verbs, short names, categories and subresources
  (``pods/status``, ``deployments/scale`` as ``autoscaling/v1`` ``Scale``). ``/openapi/v2`` answers 404;
  ``/openapi/v3`` serves path stubs only, enough for kubectl to see that PATCH takes ``fieldValidation``.
* Storage: one global resourceVersion counter; ``metadata.uid``, ``creationTimestamp``, ``resourceVersion`` on
  every object, ``generation`` on workloads (bumped when the spec changes); a no-op write changes nothing and
  emits no event. Typed list responses (``PodList``…) whose items carry no kind/apiVersion, as kube-apiserver
  sends them; ``labelSelector``, ``fieldSelector`` (only the field labels kube-apiserver supports for the
  resource — others are a 400), ``limit`` + ``continue`` (every page is the first page's snapshot, as etcd
  serves it; 410 Expired once the history no longer reaches back to it).
* Writes: create → 201 (409 AlreadyExists, ``generateName``, the namespace must exist), update with a stale
  ``metadata.resourceVersion`` → 409 Conflict, no-op updates keep the resourceVersion, ``status`` changes only
  through the status subresource and the spec only through the main resource; PATCH as JSON merge patch,
  strategic merge patch (list merge keys for the common core fields, ``$patch`` directives), JSON patch
  (RFC 6902) and server-side apply (see limitations); ``dryRun=All``; delete → 200 with the object, honouring
  finalizers (``deletionTimestamp`` first) and DeleteOptions preconditions; ``deletecollection``;
  ``fieldValidation`` Strict (400) / Warn (the default: ``Warning`` headers) / Ignore, checked for top-level,
  ``metadata`` and workload/lease ``spec`` fields — deeper fields are not schema-checked.
* Resources: core v1 pods, nodes, namespaces, configmaps, services, events, podtemplates; apps/v1 deployments,
  statefulsets, replicasets, daemonsets; batch/v1 jobs (defaults and the generated selector and template labels);
  coordination.k8s.io/v1 leases; events.k8s.io/v1 events; policy/v1 poddisruptionbudgets;
  apiextensions.k8s.io/v1 customresourcedefinitions.
* Custom resources: creating a CustomResourceDefinition serves its resource at once (status ``Established``),
  one resource per served version, with discovery, list/watch, CRUD, dryRun, ``metadata.generation`` and the
  ``status`` subresource when the version declares it (then a create's status is dropped and the main
  resource cannot change it); deleting the CRD deletes its objects. Not simulated: OpenAPI schema validation
  and pruning, defaulting, conversion between versions (every version is served from one store, only
  ``apiVersion`` differs), printer columns, the scale subresource. ``gpuscale.sim.crds`` holds definitions of
  common batch-scheduling CRDs (Volcano, coscheduling, Kueue, ProvisioningRequest).
* Subresources: ``status`` (pods, nodes, namespaces, services and the apps kinds), ``scale`` (deployments,
  statefulsets, replicasets; GET/PUT/PATCH an ``autoscaling/v1`` Scale whose ``spec.replicas`` writes through),
  ``pods/binding``, ``pods/eviction`` (policy/v1 Eviction: PodDisruptionBudgets respected as kube-apiserver
  does — Pending/finished/terminating pods ignore them, 429 with kube's cause when one allows no disruption, 500
  under two). PodDisruptionBudget statuses are kept as the disruption controller keeps them
  (``gpuscale.sim.disruption_controller``), on every change of a pod or budget of their namespace.
* Validation that real clusters enforce and that would hide bugs if skipped: object names, label keys/values,
  workload ``spec.selector`` present, non-empty, matching the template labels and immutable, pods having
  containers, pod spec immutability (except images, tolerations, activeDeadlineSeconds).
* Watch (``?watch=1``): newline-delimited events ADDED/MODIFIED/DELETED/BOOKMARK/ERROR from a resourceVersion
  (or the current state as synthetic ADDED when it is unset or "0"), with selectors applied the way the watch
  cache applies them (an object leaving the selection is DELETED, entering it is ADDED), ``timeoutSeconds``,
  ``allowWatchBookmarks`` (a BOOKMARK every ``bookmark_interval_seconds`` and one 2 s before the timeout, as the
  watch cache sends them: only when the resource changed after the watch began); a resourceVersion older than
  the retained history (see ``compact()``; for a custom resource, older than its CRD being served) yields one
  ERROR event carrying a 410 ``Expired`` Status, exactly as kube-apiserver does.
* ``Accept: application/json;as=Table`` → server-side ``meta.k8s.io/v1`` Tables with kubectl's usual columns
  for every served kind.
* Errors are metav1.Status bodies with kube-apiserver's reasons and messages (NotFound, AlreadyExists, Conflict,
  Invalid, BadRequest, MethodNotAllowed, Unauthorized, UnsupportedMediaType, Expired).
* ``events.k8s.io/v1`` Events are a second view of the core v1 Events, converted field by field.
* Delegated authentication and authorization, for aggregated API servers: ``POST``
  ``/apis/authentication.k8s.io/v1/tokenreviews`` answers from tokens registered with ``add_token`` (adding
  ``system:authenticated`` as kube-apiserver does); ``POST /apis/authorization.k8s.io/v1/subjectaccessreviews``
  answers from RBAC-style grants registered with ``allow`` (matched as RBAC matches: ``pods`` does not cover
  ``pods/log``, ``*/log`` does; a grant with a namespace acts as a RoleBinding there), and allows the
  ``system:masters`` group everything. Both validate like kube-apiserver (400/422), answer 201, are recorded in
  ``token_reviews``/``access_reviews``, and can be made to fail (``fail_reviews``) or to be slow
  (``review_delay_seconds``).
* Fault injection, in kube-apiserver's own shapes: ``fail_next`` plans failures for the next N requests of a
  verb on a resource (410 on a watch as an ERROR event with an ``Expired`` Status, 409 ``Conflict``, 429
  ``TooManyRequests`` with ``Retry-After``, 500 ``InternalError``, 503/504); ``drop_watches`` cuts open watch
  connections mid-stream; ``go_away``/``come_back`` (or ``outage(seconds)``) close the listening socket and every
  connection and reopen on the same port, storage kept. ``faults_served`` records what was answered.

Limitations (on purpose): no controllers (a Deployment creates no pods; but for PodDisruptionBudgets, nothing
updates status unless you do), no kubelet (pods are deleted at once, without a grace period), no garbage collector
(ownerReferences do not cascade; deleting a namespace deletes its objects at once, standing in for the namespace
controller), no admission webhooks, no RBAC on its own API (any bearer token is accepted unless ``tokens`` is
given; the tokens of ``add_token`` and the grants of ``allow`` only answer TokenReviews and SubjectAccessReviews),
no field ownership in server-side apply (an apply is a strategic merge of the applied configuration; no
managedFields), no OpenAPI schemas, no aggregated discovery, and no protobuf: a protobuf body gets 415, so
kubectl's typed-client generators (``kubectl create deployment``, ``create configmap``) fail — ``kubectl create
-f`` / ``apply`` / ``patch`` / ``scale`` / ``label`` / ``delete`` work.

In-process helpers (``create``, ``apply``, ``replace``, ``patch``, ``delete``, ``get``, ``list``) go through the
same code as the HTTP handlers (same validation, resourceVersions and watch events) and raise ``ApiStatusError``.
Two conveniences exist only in-process, for seeding scenarios: ``create``/``apply`` write a given ``status``
through the status subresource afterwards, and ``create`` keeps a given ``uid``/``creationTimestamp``.

Layout, one concern a module (the server holds one of each collaborator): ``apiserver`` the HTTP front and
the in-process helpers; ``storage`` objects, resourceVersions and the change history; ``writer`` create,
update, patch, scale, delete and binding; ``validation`` and ``defaults`` what kube-apiserver refuses and fills
in; ``watch`` watch streams (BOOKMARKs, 410 Expired); ``listing`` paged lists and deletecollection;
``eviction`` pods/eviction and PodDisruptionBudget statuses; ``faults`` the fault plan; ``reviews`` TokenReviews
and SubjectAccessReviews; ``discovery_docs`` the discovery documents; ``customresources`` what CRDs serve;
``proxy`` pods/proxy; ``payloads`` the served forms, Tables and request bodies.
"""

from gpuscale.sim.api_errors import ApiStatusError
from gpuscale.sim.kubeapi.apiserver import SimKubeApi
from gpuscale.sim.kubeapi.faults import ServedFault
from gpuscale.sim.kubeapi.payloads import RecordedRequest
from gpuscale.sim.kubeapi.reviews import AccessRule, ReviewUser
from gpuscale.sim.resources import RESOURCES, ResourceType

__all__ = [
    "RESOURCES",
    "AccessRule",
    "ApiStatusError",
    "RecordedRequest",
    "ResourceType",
    "ReviewUser",
    "ServedFault",
    "SimKubeApi",
]
