from django.contrib import admin
from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="index"),
    path("hold/<slug:name>/", views.hold, name="hold"),
    path("ahold/<slug:name>/", views.ahold, name="ahold"),
    path("admin/", admin.site.urls),
]
